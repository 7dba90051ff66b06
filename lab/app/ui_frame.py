"""Every page true from its first frame: the layout's values replaced by the host's state as the page is served.

Gradio sends a page the config it built at launch (each component's value as the layout set it) and only then
runs the page's load events, so a page drawn that way first shows the layout's defaults (a Load-test form of
1,5,10,20 users, "No ladder yet") and the truth seconds later. A LivePage serves its config patched instead: each
group of components carries what its redraw gives now (the redraws the page's timer sends, lab.app.ui_timer),
built once per value of the group's key and shared by every page that opens meanwhile. The page's first tick then
sends the same values again, so that its session on the server knows them too (a dropdown's choices, say).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import gradio as gr
from gradio.blocks import postprocess_update_dict

from lab.app.ui_timer import Shared

log = logging.getLogger(__name__)


class FirstFrame:
    """The groups whose values a page's first frame carries: (key, redraw, the components redraw returns)."""

    def __init__(self):
        self.groups: list[Shared] = []

    def add(self, key: Callable, redraw: Callable, outputs: Sequence) -> None:
        self.groups.append(Shared(key, lambda: props_of(outputs, redraw()), rebuild_s=0))  # fresh at every key

    def props(self) -> dict[int, dict]:
        """Each component's props as they are now, by component id."""
        found: dict[int, dict] = {}
        for group in self.groups:
            for component_id, props in group().items():
                found[component_id] = {**found.get(component_id, {}), **props}
        return found

    def patch(self, config: dict) -> dict:
        """``config`` (Gradio's, as built at launch) with every group's props as they are now (on a failure, logged,
        the config as built: the first tick brings the truth)."""
        try:
            props = self.props()
        except Exception:
            log.exception("the page's first frame shows the layout's values")
            return config
        components = [{**c, "props": {**c["props"], **props[c["id"]]}} if c["id"] in props else c
                      for c in config["components"]]
        return {**config, "components": components}


def props_of(outputs: Sequence, values) -> dict[int, dict]:
    """The props a redraw's ``values`` set in ``outputs`` (one value for one output), by component id."""
    values = list(values) if len(outputs) > 1 else [values]
    return {c._id: props for c, value in zip(outputs, values, strict=True) if (props := shown_props(c, value))}


def shown_props(component, value) -> dict:
    """What ``value`` (a plain value or a gr.update) sets in ``component``'s props, as Gradio sends an update: the
    value postprocessed, every other prop as the component built with it holds it (choices as (label, value))."""
    update = dict(value) if isinstance(value, dict) and value.get("__type__") == "update" else {"value": value}
    update.pop("__type__", None)
    if not update:  # gr.skip(): the layout's value stays
        return {}
    if set(update) != {"value"}:
        kwargs = {**component.constructor_args, **update, "render": False}
        kwargs.pop("value", None)
        component = type(component)(**kwargs)
    shown = postprocess_update_dict(component, update)
    shown.pop("__type__")
    return shown


class LivePage(gr.Blocks):
    """A gr.Blocks whose config, read as each page is served, carries ``frame``'s values (see the module doc)."""

    frame: FirstFrame | None = None

    @property
    def config(self) -> dict:
        built = self.__dict__.get("_built_config")
        return self.frame.patch(built) if self.frame is not None and built is not None else built

    @config.setter
    def config(self, value: dict) -> None:
        self.__dict__["_built_config"] = value

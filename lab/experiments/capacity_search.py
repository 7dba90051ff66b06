"""capacity_search: ``python -m lab capacity`` as an experiment, so that the page's Capacity tab runs the search
through the host's one experiment path (one task at a time, Cancel, stored as an experiment when it ends).

The search itself is lab/capacity.py's: ``run`` builds the CapacityPlan from its Params (the CLI's options, each
refusal naming the Params field), hands it to ``run_capacity`` (the runner the CLI calls) on the session's started
engines, and copies what it measured into the ExperimentResult after every probe: ``fields`` hold capacity.json
(less what every experiment.json holds already), ``rows`` its probes as the CLI's table. A cancel or a failure
keeps every finished probe, as the CLI's search does. It is named capacity_search, not capacity, so that
lab.capacity stays the search's own module.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.capacity import (
    DEFAULT_TIME_LIMIT_S,
    FLAGS,
    MIN_REQUESTS,
    REQUESTS_PER_USER,
    CapacityPlan,
    CapacityResult,
    capacity_plan,
    new_capacity,
    probe_rows,
    run_capacity,
    session_engines,
)
from lab.config import MAX_RATE, MAX_USERS
from lab.engines import registry
from lab.experiments import HELD, ended
from lab.store import list_experiments, list_results

NAME = "capacity_search"
ENGINES = registry.default_names()  # what the CLI's ``experiment capacity_search`` loads
NAMES = {key: key for key in FLAGS}  # a refusal names the Params field, not the CLI's flag


@dataclass(frozen=True)
class Params:
    """The CLI's ``capacity`` options. slo: the targets (ttft_p95=2s,tpot_p95=150ms); engines: a comma list, empty
    for every engine the session holds; max_users: the most users probed (open loop: the cap in flight);
    requests_per_user and min_requests: a probe's size; output_len: every output's length (None: the workload's);
    warmup: unmeasured requests per engine; think_time: the chat workload's pause; rate_search, start_rate,
    max_rate: the open-loop search; time_limit: seconds for the whole search."""

    slo: str = "ttft_p95=2s,tpot_p95=150ms"
    engines: str = ""
    max_users: int = MAX_USERS
    workload: str = "mixed"
    requests_per_user: int = REQUESTS_PER_USER
    min_requests: int = MIN_REQUESTS
    output_len: int | None = None
    warmup: int = 2
    seed: int = 0
    think_time: float = 1.0
    rate_search: bool = False
    start_rate: float = 1.0
    max_rate: float = MAX_RATE
    time_limit: float = DEFAULT_TIME_LIMIT_S

    def __post_init__(self) -> None:
        self.plan(None, ())  # every rule but the engines' and the lengths' (they need the engine config)

    def engine_names(self) -> tuple[str, ...]:
        """The engines asked for, in order (empty: the session's)."""
        return tuple(n.strip() for n in self.engines.replace(" ", ",").split(",") if n.strip())

    def plan(self, config, engines: tuple[str, ...]) -> CapacityPlan:
        """The validated CapacityPlan (lab.capacity.capacity_plan: the CLI's rules, refusals naming these fields)."""
        return capacity_plan(self.slo, engines, config, workload=self.workload, max_users=self.max_users,
                             requests_per_user=self.requests_per_user, min_requests=self.min_requests,
                             output_len=self.output_len, warmup=self.warmup, seed=self.seed,
                             think_s=self.think_time, rate_search=self.rate_search, start_rate=self.start_rate,
                             max_rate=self.max_rate, time_limit_s=self.time_limit, names=NAMES)


def check(params: Params, config) -> None:
    """The rules that need the engine config: the engines it knows and every probe's lengths."""
    params.plan(config, params.engine_names() or ENGINES)


def loaded(session, params: Params) -> tuple[str, ...]:
    """The engines to search: those asked for, each loaded in the session (ValueError naming one that is not)."""
    return session_engines(session, params.engine_names() or tuple(session.engines))


async def run(session, params: Params, result, notify) -> None:
    """Search each engine's capacity with lab.capacity's runner, the result's fields following every probe; what
    stopped the search (a cancel, a failure) is raised again after its probes are copied, so the experiment ends
    as the search did."""
    plan = params.plan(session.config, loaded(session, params))
    capacity = new_capacity(session, plan)

    def follow(found: CapacityResult) -> None:  # after every probe and at every step (its message, its sentences)
        show(result, found)
        notify(result)

    follow(capacity)
    await run_capacity(session, plan, capacity, follow, on_step=follow)
    ended(capacity)


def show(result, capacity: CapacityResult) -> None:
    """The search's capacity.json as the experiment's fields (less what experiment.json holds of its own: status,
    times, model, device, versions, engine args), its probes as rows, its message."""
    data = capacity.to_dict()
    result.fields = {k: v for k, v in data.items() if k not in HELD and k != "capacity_id"}
    result.rows = probe_rows(data)
    result.message = capacity.message


def as_capacity(data: dict) -> dict:
    """A stored capacity_search experiment (experiment.json's dict, or a live result's view) as capacity.json reads:
    the figure, the sentences and the report take either."""
    return {**data, "capacity_id": data.get("capacity_id", data.get("experiment_id"))}


def live_view(result) -> dict:
    """A live (or ended) capacity_search ExperimentResult as capacity.json reads."""
    return as_capacity({**result.fields, "experiment_id": result.id, "status": str(result.status),
                        "started_at": result.started_at, "ended_at": result.ended_at, "model": result.model})


def stored(db_path) -> list[dict]:
    """Every stored capacity search, newest first, as capacity.json dicts: the CLI's (kind capacity) and the
    page's (this experiment)."""
    found = list_results(db_path, "capacity") + [as_capacity(d) for d in list_experiments(db_path, NAME)]
    return sorted(found, key=lambda d: d["started_at"], reverse=True)

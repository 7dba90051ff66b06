"""The app wing: the engine host, its remote proxy and the page that reads it through the ``Host`` seam.

seam.py declares what a page may read and command; host.py implements it over a LabSession; host_process.py
runs that host in a process of its own and forwards exactly the seam's members; mirror.py copies what a run
holds across; dashboard.py turns results into the page's words and figures; access.py says who may command the
app (the presenter) and where an endpoint may point; ui*.py are the Gradio tabs (ui_access.py guards their commands).
"""

"""The run dashboard: `agentscope-rft dashboard [runs/]` (docs/dashboard.md).

A FastAPI app (`app.create_app`) serving a JSON API over a runs folder (`runs`: discovery and
summaries; `episodes`: episodes, token-level samples, review export) and one static page
(`static/`: plain HTML, JavaScript and SVG, shipped with the package; nothing from a CDN).
"""

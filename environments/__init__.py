"""Offline environments for the example agents: web search, ALFWorld and FrozenLake.

Each environment runs without network or GPU, generates its own tasks deterministically from a
seed, and also accepts real data (a user's corpus, downloaded ALFWorld games). See
`environments/README.md`.
"""

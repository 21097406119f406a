"""Agent designs (OPERA, Mujica, Omne). Installed as `mhqa_graph.graphs`."""

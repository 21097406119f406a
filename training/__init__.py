"""Trainers (MyGO, MAPGRPO, Omne stages). Installed as `mhqa_graph.training`."""

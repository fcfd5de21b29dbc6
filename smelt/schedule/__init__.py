"""The schedule stage: between the graph passes and code generation, every decision about *how*
a node is computed is made here and written on the node, typed; templates only render it.

For each heavy node the stage resolves forced (an option or a node attribute) -> tuned (the
tuning database) -> default (a cost model over the target's facts). What lives here: the tuning
database (``db``), the cost models, the global layout search (``layout_search``) and the
per-op schedule decisions (one module per op family).
"""

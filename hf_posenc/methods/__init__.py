"""The methods, one module each (yarn.py, dca.py, hierarchical.py, ...): a dataclass of the method's parameters
and what it does to a model, through the interface of its kind (hf_posenc/config.py); registry.py registers
them. Beside them, the mechanisms the methods build (rope.py, learned.py, sinusoidal.py, bias.py, xpos.py,
remapped.py, exact_cache.py): the math first, then the nn.Modules. docs/ARCHITECTURE.md has the map."""

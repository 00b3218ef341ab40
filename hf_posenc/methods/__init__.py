"""One module per positional mechanism: the pure math first, then the nn.Module."""

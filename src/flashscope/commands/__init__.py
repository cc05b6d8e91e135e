"""One module per ``flashscope`` subcommand; each exposes ``register(subparsers)``."""

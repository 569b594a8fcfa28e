"""What several test modules share that is not a fixture: tiny configs, the tiny transformers
models behind the parity fixtures, the FlopCounterMode reference, repository paths.
Not a test module: pytest collects nothing here."""

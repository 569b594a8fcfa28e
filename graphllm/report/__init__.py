"""Reports over analysed graphs: the trace document, tables for the terminal, plots."""

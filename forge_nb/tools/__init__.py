"""Tools that make the package's data: the bundled model's recipe and its character tokenizer."""

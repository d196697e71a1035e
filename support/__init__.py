"""What the program stands on that knows nothing of the Transformer: files, errors and the command
line (utils), devices and precision (devices), BLEU (scoring), pictures (pictures)."""

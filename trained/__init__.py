"""A trained run: its checkpoints (checkpoints), loading it and translating with it (runs), lines of
text in and out (lines), and its export for serving (serving)."""

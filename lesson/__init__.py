"""The lesson's maker: `python -m lesson.make` runs lesson.ipynb afresh and writes both notebooks."""

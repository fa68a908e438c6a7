"""Scripts that build the bundled files (the demo tokenizer, corpus and models, and the models
fitted from them on other worlds: `world_reading`) and plan every paper preset; run from a
checkout as `python -m tools.<name>` or `python tools/<name>.py`."""

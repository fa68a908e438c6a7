"""π-Play: an examiner, a student, and an EMA teacher that sees how each question was built."""

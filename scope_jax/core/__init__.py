"""The self-play framework every method runs on: the run loop (`runner`), what a method is given
(`runtime`: policies, frozen params, the KL reference), roles, the demo warm-up, the stage
schedule and the parser guard. Methods build on it; nothing below it imports it."""

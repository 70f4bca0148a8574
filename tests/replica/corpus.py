"""Natural-language text for prompts of known lengths in engine tests."""

PARAGRAPHS = [
    "The river town woke slowly. Fishermen pulled their boats onto the gravel, gulls argued over scraps, "
    "and the baker opened her shutters to let the smell of bread into the street.",
    "A compiler translates a program written in one language into another, usually lower-level, language. "
    "It checks the program for errors, builds an intermediate representation, optimises it, and emits code.",
    "In winter the mountain pass closes for months. Travellers who once crossed it on foot now take the "
    "tunnel, which was dug over eleven years by crews working from both ends toward the middle.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Plants store the sugar as "
    "starch, and animals that eat the plants release the stored energy when they digest it.",
    "The committee met on Tuesday to discuss the budget. After two hours of debate they agreed to fund the "
    "new library wing, postpone the road repairs, and review the parks programme in the spring.",
    "Ships once navigated by the stars. A sextant measured the angle between a star and the horizon, and "
    "tables printed in thick almanacs turned that angle into a line of position on the chart.",
    "Good soup starts with a good stock. Roast the bones first, cover them with cold water, and let the pot "
    "barely simmer for hours; skim the surface often and never let it boil hard.",
    "The orchestra tuned to the oboe's A. The conductor raised her baton, waited until the hall was silent, "
    "and the first quiet notes of the violins rose from the stage.",
]

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three fruits that are red.",
    "How do bees make honey?",
    "Give me a tip for learning a new language.",
    "What is 12 times 7?",
    "Describe a sunset in one sentence.",
]


def long_text(repeats: int = 6) -> str:
    """About 250 tokens per repeat, varied enough that the model does not loop."""
    parts = []
    for r in range(repeats):
        for i, p in enumerate(PARAGRAPHS):
            parts.append(PARAGRAPHS[(i + r) % len(PARAGRAPHS)] if r % 2 == 0 else p)
    return "\n\n".join(parts)

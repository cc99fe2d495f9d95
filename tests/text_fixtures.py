"""Deterministic English text for prompts (no data set download): a long public-domain-style passage."""

PASSAGE = (
    "The river town woke slowly in the grey light of the morning. Fishermen pulled their boats onto the "
    "shingle, and the baker on the corner opened his shutters to let the smell of bread drift into the "
    "street. Children ran past the church on their way to school, and an old dog followed them as far as "
    "the bridge before turning back to sleep in the sun. In the market square the traders set out their "
    "stalls: apples and pears from the orchards on the hill, cheese from the farms beyond the forest, "
    "bolts of cloth dyed blue and red and yellow. The mayor walked through the crowd greeting everyone by "
    "name, for he had lived in the town all his life and knew every family and every quarrel. "
)


def long_text(min_words: int) -> str:
    """Repeat the passage, numbering each copy so that the text never becomes a trivially periodic string."""
    parts, words, i = [], 0, 0
    while words < min_words:
        i += 1
        chunk = f"Chapter {i}. " + PASSAGE
        parts.append(chunk)
        words += len(chunk.split())
    return "".join(parts)

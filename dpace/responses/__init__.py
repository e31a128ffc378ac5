"""Stage 3, responses: the training conversations, answered by the target (``generation``: transformers on
CPU, SGLang's offline engine on GPU) or imported where the target's answers were released (``conversations``)."""

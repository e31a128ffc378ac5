"""Stage 5, training: the drafter and how it learns.

``objectives`` (every loss, one registry record each), ``drafter`` (the DFlash draft model), ``online_model``
(the objective-aware training wrapper), ``draft_vocab`` (the optional pruned draft vocabulary),
``train_config`` (the settings), ``loop`` (the local training loop: check, set up, train, save),
``training_records`` (steps.jsonl and summary.json), ``specforge_backend`` (training through SpecForge on GPUs)
and ``training_check`` (GPU training against the committed CPU curve ``training_reference.json``).
"""

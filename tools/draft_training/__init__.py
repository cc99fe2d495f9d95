"""Training an MTP draft layer for the built-in model (`python -m tools.draft_training`): corpus generation
(draft_corpus), the layer (mtp_layer), the unrolled loss (draft_loss), the acceptance simulation
(draft_acceptance) and the time-budgeted pipeline (train_draft). The checkpoint writer SGLang's loaders read is
the product's `sglang_ext.models.mtp_checkpoint`."""

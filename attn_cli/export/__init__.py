"""Handing a trained model to CTranslate2, the inference engine made for serving: `convert` writes a
checkpoint as a CTranslate2 model directory, `exported` loads one and searches with it. The layer
after training (it reads checkpoints) and before the command line; ctranslate2 is an optional
dependency, imported only here."""

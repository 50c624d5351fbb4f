"""What the tests share beyond pytest's fixtures (conftest.py): small models and sources, the
reference searches, a trained Marian model, the serving helpers and the chaos trials' machinery."""

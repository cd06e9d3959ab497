"""The goldens: what they are (checks), and the gated refresh that is their only writer."""

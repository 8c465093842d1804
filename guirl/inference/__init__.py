"""The inference engines behind the broker (hf, openai, sglang, scripted) and the chat renderer they share."""

"""Adapters that let code written for other data-sharing libraries run on batchcast."""

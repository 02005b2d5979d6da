"""Retrieval pipeline: one candidate record flowing through composable stages (retrieve -> CMC -> CE)."""

"""The agents this deployment runs: LangGraph graphs with their invariants and compensations."""

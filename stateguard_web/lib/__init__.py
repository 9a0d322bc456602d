"""Small helpers the project's apps share, with no domain of their own."""

"""`mlx-spec chat`: a Textual chat that shows speculation working."""

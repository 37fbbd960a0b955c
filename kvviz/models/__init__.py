"""Model families, one readable teaching file each, and the products their fast paths use."""

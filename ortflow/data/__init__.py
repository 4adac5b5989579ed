"""What trainers read: the inputs of a graph, sources read in chunks, the portable shuffle and the preprocessing of tables."""

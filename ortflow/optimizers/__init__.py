"""How weights move: the update rules (`learning_rates`) and their schedules."""

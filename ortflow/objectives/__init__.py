"""What training minimizes: losses, penalties, each estimator's own loss, and `add_loss_output`."""

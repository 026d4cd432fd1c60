"""Command-line programs: data building, training, shipping, and the Cloud TPU launcher."""

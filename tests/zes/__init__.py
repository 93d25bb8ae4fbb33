"""A compiled stand-in for the Level Zero loader, to test the Sysman source without Intel hardware."""

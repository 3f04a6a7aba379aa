"""Generated from proto/ by ``make proto`` and committed; do not edit."""

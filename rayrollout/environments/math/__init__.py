"""Math: a safe arithmetic calculator tool; answers are checked with math_verify."""

//! U3M_* configuration (read once at start-up).

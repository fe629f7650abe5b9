//! Live views.

//! Issue 27: the closure part (tests land with it).

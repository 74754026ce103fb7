//! Issue 27: the audit part (tests land with it).

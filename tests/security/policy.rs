//! Issue 27: the policy part (tests land with it).

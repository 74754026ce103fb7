//! Issue 27: the authentication part (tests land with it).

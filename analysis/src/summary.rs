//! Job and rank summaries, their text rendering and the stable summary JSON.

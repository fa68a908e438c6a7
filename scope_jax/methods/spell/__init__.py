"""SPELL (Yang et al.): one policy plays questioner, responder and verifier over document clusters."""

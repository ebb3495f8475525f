"""The libp2p pieces relays use to reach each other: TCP, Noise XX, yamux, stream frames."""

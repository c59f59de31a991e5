"""What the SDK learns about its own process without being told: when the OS started it, and what the
framework's CUDA caching allocator holds. Standard library only."""

"""Talking between ranks: rank-zero helpers and collectives, the shared-memory agreement board, the hang
bound, and naming a lost or hung peer."""

"""Starting and ending the ranks: where this process sits in the world, the devices, the script and spawn
launchers, parent death and a clean shutdown."""

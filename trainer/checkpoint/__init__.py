"""What a checkpoint holds and how a run resumes from one: the schema, the checks of a loaded one, the loop
position, `ckpt_path` lookup and the import of Lightning's checkpoints."""

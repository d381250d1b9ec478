/* `needle build CKPT --lora ADAPTER`: is ADAPTER for CKPT? */
#ifndef ND_CLI_ADAPTER_BASE_H
#define ND_CLI_ADAPTER_BASE_H

/* An adapter records the base it was trained on (needle_c_state.
 * base_checkpoint). When that is the built-in nano base and ckpt is
 * another checkpoint (upstream's needle2.pkl, say), the LoRA shapes cannot
 * fit: print why and the command that builds the adapter (stderr) and
 * return 1. 0 otherwise (nothing recorded, the same base, or a base other
 * than the nano one: the merge checks the shapes). */
int cli_check_adapter_base(const char *ckpt, const char *adapter);

#endif

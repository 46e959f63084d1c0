/* Stand-in for libge_runner.so: torch_npu lists it as NEEDED. The simulator implements
 * none of its functions yet; the library exists so that loading succeeds, and a
 * lookup of a missing function fails the way it would on a CANN install lacking it. */
int aclsim_ge_runner_present __attribute__((visibility("default"))) = 1;

/* Stand-in for CANN acl/acl.h. */
#ifndef ACLSIM_ACL_H_
#define ACLSIM_ACL_H_

#include "acl/acl_base.h"
#include "acl/acl_rt.h"
#include "acl/acl_op.h"

#endif

// The keys page: the signed-in tenant's keys (the tenant's id is in #keys' data).
"use strict";
window.DLaaS.keys.show(document.getElementById("keys").dataset.tenantId);

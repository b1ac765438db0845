"""The method's geometry (method.md): contrastive pair sets (`pairs`), v_hack extraction and its held-out evaluation
(`basis`, `basis_eval`), the arms as data (`arms`), their gradient edits in rotated coordinates (`projection`,
`optim`), the routing gate (`gate`), and what one run reads and carries about v_hack (`direction`).

May import: common, env, policy, config.
"""

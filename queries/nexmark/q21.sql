-- Nexmark q21: add channel id. The channel's id: a fixed one for the four big channels, else
-- the url's channel_id parameter.
SELECT auction, bidder, price, channel,
       CASE
           WHEN lower(channel) = 'apple' THEN '0'
           WHEN lower(channel) = 'google' THEN '1'
           WHEN lower(channel) = 'facebook' THEN '2'
           WHEN lower(channel) = 'baidu' THEN '3'
           ELSE regexp_match(url, '(&|^)channel_id=([^&]*)')[2]
       END AS channel_id
FROM STREAM bid
WHERE regexp_match(url, '(&|^)channel_id=([^&]*)')[2] IS NOT NULL
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu');
